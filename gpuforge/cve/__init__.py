"""cve room: the CVE gate: scanner JSON judged against the allowlist into a verdict that can be signed (gate), and
the prod SBOMs a re-scan reads (docs/cve.md)."""
