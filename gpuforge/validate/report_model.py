"""The shape of a validation report (report.json, and the predicate `validate --attest` signs): the validator
plugin's fields, then what `gpuforge validate` adds (evidence, problems, green, run) and what signing adds to `run`.

Readers load a report through `Report` and read attributes; `dump()` gives back exactly the keys and values that were
read (unset fields stay absent, an int stays an int), so report files, their recorded digests and signed statements
are unchanged by a load. A report of another shape is one line (StateError, exit 8), as a state file is.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuforge.errors import StateError

# strict: a string where a number or a flag belongs is refused, never coerced; int | float: a JSON round trip through
# Go (cosign) turns 2.0 into 2, and the dump must give back what was read.
_SHAPE = ConfigDict(extra="forbid", strict=True)
Number = int | float


class Check(BaseModel):
    """One validator's outcome (passed | failed | skipped), its time and its message (a skip's reason)."""

    model_config = _SHAPE
    id: str
    module: str
    name: str
    outcome: str
    seconds: Number = 0
    message: str | None = None
    skip: str | None = None  # a skip's typed reason (gpuforge.validate.selection.EnvSkip), the one the evidence reads


class Kind(BaseModel):
    """The image's kind the validators were chosen for (gpuforge.validate.selection.Kind)."""

    model_config = _SHAPE
    flavor: str | None = None
    source: str | None = None
    gpu: bool = False


class NotApplicable(BaseModel):
    """A validator the image's kind does not call for, and why (deselected at collection, never run)."""

    model_config = _SHAPE
    id: str
    why: str


class Selection(BaseModel):
    """How the run was narrowed (-k, -m, --deselect): a narrowed run never promotes. Apart from that, the kind the
    validators were chosen for and those that do not apply to it."""

    model_config = _SHAPE
    keyword: str = ""
    markexpr: str = ""
    deselected: list[str] = []
    narrowed: bool = False
    kind: Kind | None = None
    not_applicable: list[NotApplicable] = []


class GpuHost(BaseModel):
    """The GPU host a GPU run saw: what prod's per-pool check matches a fleet pool against."""

    model_config = _SHAPE
    gpu_names: list[str] = []
    gpu_models: list[str] = []
    capabilities: list[str] = []
    driver: str | None = None
    count: int = 0
    runner: str | None = None


class Evidence(BaseModel):
    """The block `gpuforge validate` stamps (gpuforge.validate.evidence.stamp): what the report is judged against."""

    model_config = _SHAPE
    required: list[str] = []
    kind: Kind | None = None  # what `required` was chosen for
    missing: list[str] = []
    partial: bool = False
    gpu_required: bool = False
    validator_set: str | None = None
    gpuforge_version: str | None = None
    image_id: str | None = None
    repo_digests: list[str] = []
    gpu_host: GpuHost | None = None
    # what the run proved, as content (gpuforge.validate.evidence.content): evidence is reused by these
    diff_ids: list[str] = []
    config: str | None = None
    inputs: str | None = None


class ReusedFrom(BaseModel):
    """A statement that reuses another's checks (gpuforge.evidence.reuse): the statement it was checked against,
    when that one was signed, and the content key both share."""

    model_config = _SHAPE
    source: str
    signed_at: str | None = None
    key: str


class Run(BaseModel):
    """Who made the report (gpuforge.validate.report.finish) and, in a signed statement, who signed it in the run
    (gpuforge.evidence.signed_run: the RunInfo fields, signed_in_run, subject, signed_at; signed_offline when the run
    signed into a bundle rather than onto the registry)."""

    model_config = _SHAPE
    gpuforge_version: str | None = None
    revision: str | None = None
    machine: str | None = None
    finished: str | None = None
    id: str | None = None
    git_revision: str | None = None
    git_dirty: bool | None = None
    host: str | None = None
    user: str | None = None
    signed_in_run: bool = False
    subject: str | None = None
    signed_at: str | None = None
    reused_from: ReusedFrom | None = None
    canary: str | None = None  # `gpuforge canary --env ENV`: a re-run on the digest ENV holds
    signed_offline: bool = False  # `validate --gpu --bundle`: signed with no registry, attached later (`gpuforge attach`)


class Report(BaseModel):
    """A validation report. Required: what every report the validator plugin writes holds and the verdict reads."""

    model_config = _SHAPE
    exit_status: int
    gpu: bool
    checks: list[Check]
    target: str | None = None
    image: str | None = None
    host: str | None = None
    started: Number | None = None  # epoch seconds
    seconds: Number = 0
    facts: dict[str, Any] = {}  # measured values (versions, driver, sbom...): each validator's own shape
    selection: Selection = Selection()
    evidence: Evidence | None = None
    problems: list[str] | None = None
    green: bool | None = None
    run: Run | None = None

    @classmethod
    def of(cls, data: Report | dict[str, Any], where: str = "validation report") -> Report:
        """`data` as a Report (a Report as is); another shape is one line naming `where` and the first bad field."""
        if isinstance(data, Report):
            return data
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "(top level)"
            msg = f"{where}: not a validation report of this gpuforge ({field}: {err['msg']}); re-run validation"
            raise StateError(msg) from None

    @classmethod
    def from_json(cls, text: str, where: str) -> Report:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            msg = f"{where}: report is not valid JSON ({e.msg} at line {e.lineno}; truncated?); re-run validation"
            raise StateError(msg) from None
        if not isinstance(data, dict):
            msg = f"{where}: not a validation report (expected an object with a checks list); re-run validation"
            raise StateError(msg)
        return cls.of(data, where)

    def dump(self) -> dict[str, Any]:
        """The report as JSON data: the keys and values it was made from, nothing added."""
        return self.model_dump(exclude_unset=True)

    def gpu_run(self) -> bool:
        """A GPU run judged as one: run with --gpu and stamped with the GPU required set."""
        return self.gpu and bool(self.evidence and self.evidence.gpu_required)

    def gpu_summary(self) -> tuple[str | None, str | None]:
        """(GPU model(s), driver) as the run saw them: facts.gpus, or the driver facts' gpus (the validators' shape)."""
        given = self.facts.get("driver")
        drv = given if isinstance(given, dict) else {}
        gpus = self.facts.get("gpus") or drv.get("gpus") or []
        model = ", ".join(sorted({str(g.get("name")) for g in gpus if isinstance(g, dict) and g.get("name")})) or None
        return model, drv.get("driver")

    def validated_at(self) -> str | None:
        """When: signed (a statement; a reused one: when the statement it reuses was), else started (a report file),
        else unknown. Reuse never makes evidence younger than the run that made it."""
        if self.run and self.run.reused_from and self.run.reused_from.signed_at:
            return self.run.reused_from.signed_at
        if self.run and self.run.signed_at:
            return self.run.signed_at
        if self.started is not None:
            return dt.datetime.fromtimestamp(self.started, dt.UTC).isoformat(timespec="seconds")
        return None

    def host_of(self) -> GpuHost:
        """The GPU host the evidence names (empty when it names none)."""
        return (self.evidence.gpu_host if self.evidence else None) or GpuHost()
