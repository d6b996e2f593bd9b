"""OCI hooks nodeprep's CDI spec carries (run by the container runtime on every container start)."""
