"""The records of this test run, as a library caller reads them: the state dir comes from the state_dir setting
(GPUFORGE_STATE_DIR, which tests/conftest.py sets for the run and its CLI subprocesses, and tests monkeypatch), read
at each call. `records.require_build(id)` is `Records(<that dir>).require_build(id)`; other names are
gpuforge.state.records'.
The stage settings are the typed ones the CLI makes (gpuforge.options.RegistrySettings, SigningSettings), resolved
from the environment at each call."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from gpuforge import options
from gpuforge.state import records as _module


def _setting(name: str):
    """One setting's value as the environment gives it now (the table's check and default apply)."""
    return options.resolve_one(options.SETTINGS[name]).value


def _stage(cls):
    """A stage's typed settings (gpuforge.options.STAGES), each field the setting of its name as the environment gives
    it now."""
    return cls(**{f.name: _setting(f.name) for f in fields(cls)})


class _Here:
    def __getattr__(self, name: str):
        if hasattr(_module.Records, name):
            return getattr(_module.Records(Path(_setting("state_dir"))), name)
        return getattr(_module, name)

    def state_dir(self) -> Path:
        return self.here().state_dir

    def here(self) -> _module.Records:
        """The Records object itself, for a stage entry point that takes one."""
        return _module.Records(Path(_setting("state_dir")))


def log_dir() -> Path:
    """The log_dir setting (GPUFORGE_LOG_DIR, which tests/conftest.py sets for the run)."""
    return Path(_setting("log_dir"))


def auth():
    """The registry credentials a library caller has in this environment (GPUFORGE_REGISTRY_USER/PASSWORD/INSECURE)."""
    from gpuforge.registry.client import RegistryAuth

    reg = _stage(options.RegistrySettings)
    return RegistryAuth(user=reg.registry_user, password=reg.registry_password, insecure=reg.registry_insecure)


def verifier(key: str | None = None):
    """A Verifier as the CLI makes one: `key`, else GPUFORGE_COSIGN_PUBLIC_KEY, else the keyless identity + issuer."""
    from gpuforge.registry import attest

    s = _stage(options.SigningSettings)
    return attest.Verifier.of(key=key or s.verify_key, identity=s.cosign_identity, issuer=s.cosign_issuer,
                              tlog=s.cosign_tlog, auth=auth())


def signer(key: str | None = None):
    from gpuforge.registry import attest

    return attest.Signer(key=key, tlog=_stage(options.SigningSettings).cosign_tlog, auth=auth())


records = _Here()


# --- the keyword arguments the CLI gives each publish entry point, as a library caller makes them ----------------

def push_kw() -> dict:
    return {"records": records.here(), "auth": auth(), "log_dir": log_dir()}


def promote_kw(sign_key: str | None, key: str | None = None) -> dict:
    """`key`: the public key (else GPUFORGE_COSIGN_PUBLIC_KEY or the keyless identity); `sign_key` signs the records."""
    return {"records": records.here(), "auth": auth(), "verifier": verifier(key), "signer": signer(sign_key),
            "require_cve": bool(_setting("prod_require_cve"))}  # as the CLI: GPUFORGE_PROD_REQUIRE_CVE


def build_kw(**given) -> dict:
    """BuildOptions' records, log_dir and pinned apt state (GPUFORGE_APT_STATE: tests/conftest.py pins one per run) as
    the CLI resolves them; `given` (e.g. log_dir=tmp_path) wins."""
    from gpuforge.builder import aptstate

    pin = _setting("apt_state")
    return {"records": records.here(), "log_dir": log_dir(),
            "apt_state": aptstate.pinned(pin, "GPUFORGE_APT_STATE") if pin else None} | given
