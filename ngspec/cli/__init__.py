"""The `ngspec` command line: thin command modules over the library."""
