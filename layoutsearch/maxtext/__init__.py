"""MaxText, the other side of the round trip: its version tables (:mod:`.version`), which MaxText tensor is
which tensor of a zoo graph (:mod:`.tensors`), running MaxText's own code on a config (:mod:`.runner`, which
runs the script :mod:`.probe` under the Python that has MaxText), comparing what MaxText builds with a plan
(:mod:`.compare`) and reading a MaxText run into a graph and a layout (:mod:`.config_in`). The export itself
is :mod:`layoutsearch.export.maxtext`."""
