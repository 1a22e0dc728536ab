"""What a failed build's log says went wrong, as one actionable sentence for the error line (the log's last line
says it only when nothing here is recognised)."""

from __future__ import annotations

import re

# Common build failures, recognised in the log, as (pattern, what it means and how to fix it); the
# first match is named in the error line instead of the log's last line.
DIAGNOSES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.I), why) for p, why in (
    (r"CERTIFICATE_VERIFY_FAILED|certificate verify failed|invalid peer certificate|UnknownIssuer|"
     r"self[- ]signed certificate in certificate chain",
     "TLS certificate verification failed (a TLS-intercepting proxy?): pass its CA bundle with --extra-ca FILE "
     "or GPUFORGE_EXTRA_CA (by default gpuforge passes the host's PIP_CERT/SSL_CERT_FILE/REQUESTS_CA_BUNDLE)"),
    (r"no space left on device",
     "no space left on device: free disk for the engine (docker image prune; docker builder prune) or move its data-root"),
    (r"pull access denied|failed to resolve source metadata for|manifest unknown|failed to do request: Head .*/manifests/|"
     r"repository does not exist|(?:base|FROM) image .* not found",
     "the base image cannot be pulled: check the name/tag, `docker login`, or mirror it and point matrix.yaml's "
     "bases / cuda_base_image at the mirror"),
    (r"No matching distribution found for|Because there is no version of|no version of \S+ (?:==|matching)|"
     r"Could not find a version that satisfies the requirement|unsatisfiable",
     "a pinned Python package version is not on the index: check the pin (gpuforge/image/data/compat.yaml, "
     "data/image.yaml) or point --index-url / --pypi-url at an index that has it"),
    (r"Failed to fetch|Temporary failure in name resolution|Could not resolve host|Connection refused|"
     r"Network is unreachable|ConnectTimeout|Max retries exceeded|error sending request for url|dns error|"
     r"Failed to download|timed out",
     "a package index or mirror is unreachable from the build: check the network/proxy, or use --index-url / "
     "--pypi-url (and matrix.yaml's mirrors) to reach one that is"),
))


def diagnose(log_text: str) -> str | None:
    """What a failed build's log says went wrong, as an actionable sentence (None when unrecognised)."""
    for pattern, why in DIAGNOSES:
        if pattern.search(log_text):
            return why
    return None
