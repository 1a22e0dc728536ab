"""publish room: the decisions taken on signed evidence, each a signed transaction on the registry: promote by
digest (dev, prod), rollback, status and history, prod's extra requirements and the admission policies. The bytes are
pushed by gpuforge/push/, the evidence is signed and read by gpuforge/evidence/, and the registry door itself is
gpuforge/registry/."""
