"""publish stage: push, sign evidence in the validating run, promote, rollback, status and history, as signed
transactions on the registry (the registry door itself is gpuforge/registry/)."""
