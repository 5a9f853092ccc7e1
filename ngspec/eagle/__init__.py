"""EAGLE draft heads: the model, loading/saving in the public layout, training."""
