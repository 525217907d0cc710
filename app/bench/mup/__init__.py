"""μP's benches: the coordinate check (coord_check.py: activations against the width, per
parametrization) and the learning-rate transfer with its studies (transfer.py); figures.py draws
both."""
