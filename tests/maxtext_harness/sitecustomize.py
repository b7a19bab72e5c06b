"""Installed on the MaxText test venv's path by the wrapper interpreter (tests/maxtext_harness/README.md):
stubs for MaxText's optional imports that its config, mesh and model code do not use."""
import stubs

stubs.install()
