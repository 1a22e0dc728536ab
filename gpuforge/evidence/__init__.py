"""evidence room: what a validating run signs and how it is read back. Signing in the run (signed_run), the standard
statements beside gpuforge's own predicate (statements), reuse by content (reuse), canaries (canary), bundles from GPU
runners with no registry and their attachment (bundle, attach), who signed (runinfo), a statement's age (age) and the
fleet pools a GPU statement covers (coverage). What is promoted on it is decided in gpuforge/publish/."""
