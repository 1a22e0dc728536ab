"""The records of this test run, as a library caller reads them: the state dir comes from the state_dir setting
(GPUFORGE_STATE_DIR, which tests/conftest.py sets for the run and its CLI subprocesses, and tests monkeypatch), read
at each call. `records.require(id)` is `Records(<that dir>).require(id)`; other names are gpuforge.state.records'."""

from __future__ import annotations

from pathlib import Path

from gpuforge import options
from gpuforge.state import records as _module


class _Here:
    def __getattr__(self, name: str):
        if hasattr(_module.Records, name):
            return getattr(_module.Records(Path(options.setting("state_dir"))), name)
        return getattr(_module, name)

    def state_dir(self) -> Path:
        return self.here().state_dir

    def here(self) -> _module.Records:
        """The Records object itself, for a stage entry point that takes one."""
        return _module.Records(Path(options.setting("state_dir")))


def log_dir() -> Path:
    """The log_dir setting (GPUFORGE_LOG_DIR, which tests/conftest.py sets for the run)."""
    return Path(options.setting("log_dir"))


def auth():
    """The registry credentials a library caller has in this environment (GPUFORGE_REGISTRY_USER/PASSWORD/INSECURE)."""
    from gpuforge.registry.client import RegistryAuth

    return RegistryAuth(user=options.setting("registry_user"), password=options.setting("registry_password"),
                        insecure=options.setting("registry_insecure"))


def verifier(key: str | None = None):
    """A Verifier as the CLI makes one: `key`, else GPUFORGE_COSIGN_PUBLIC_KEY, else the keyless identity + issuer."""
    from gpuforge.registry import attest

    return attest.Verifier.of(key=key or options.setting("verify_key"), identity=options.setting("cosign_identity"),
                              issuer=options.setting("cosign_issuer"), tlog=options.setting("cosign_tlog"), auth=auth())


def signer(key: str | None = None):
    from gpuforge.registry import attest

    return attest.Signer(key=key, tlog=options.setting("cosign_tlog"), auth=auth())


records = _Here()


# --- the keyword arguments the CLI gives each publish entry point, as a library caller makes them ----------------

def push_kw() -> dict:
    return {"records": records.here(), "auth": auth(), "log_dir": log_dir()}


def promote_kw(sign_key: str | None, key: str | None = None) -> dict:
    """`key`: the public key (else GPUFORGE_COSIGN_PUBLIC_KEY or the keyless identity); `sign_key` signs the records."""
    return {"records": records.here(), "auth": auth(), "verifier": verifier(key), "signer": signer(sign_key),
            "require_cve": bool(options.setting("prod_require_cve"))}  # as the CLI: GPUFORGE_PROD_REQUIRE_CVE


def build_kw(**given) -> dict:
    """BuildOptions' records, log_dir and pinned apt state (GPUFORGE_APT_STATE: tests/conftest.py pins one per run) as
    the CLI resolves them; `given` (e.g. log_dir=tmp_path) wins."""
    from gpuforge.builder import aptstate

    pin = options.setting("apt_state")
    return {"records": records.here(), "log_dir": log_dir(),
            "apt_state": aptstate.pinned(pin, "GPUFORGE_APT_STATE") if pin else None} | given
