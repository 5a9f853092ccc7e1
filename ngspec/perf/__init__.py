"""Performance measurement: verify-cost tables (and, later, the profile-bound sweep)."""
