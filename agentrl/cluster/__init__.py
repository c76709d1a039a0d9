"""Ray as the cluster backend: places the pieces of a run on a Ray cluster."""
