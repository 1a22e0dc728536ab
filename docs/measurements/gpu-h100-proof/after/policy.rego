# gpuforge 0.1.0 admission policy for environment prod, GPU pool h100; generated 2026-12-07T03:29:50+00:00.
# Admits a digest by a signed in-toto Test Result for scope gpuforge.dev/pool/h100: PASSED or WARNED, no failed test, signed
# at or after 2026-11-07T03:29:50+00:00 (time to live 30 days). The cut-off is fixed here: regenerate at least daily.
# cosign verify-attestation --policy reads allow; conftest reads deny (--namespace signature).
package signature

import rego.v1

default allow := false

allow if count(deny) == 0

deny contains "predicateType is not https://in-toto.io/attestation/test-result/v0.1" if not test_result
deny contains "predicate.result is not PASSED or WARNED" if not passed_or_warned
deny contains "predicate.failedTests is not an empty list" if not no_failed_test
deny contains "predicate.configuration[0] is not scope gpuforge.dev/pool/h100" if not in_scope
deny contains "predicate.configuration[1] is not gpuforge.dev/validators" if not validators_named
deny contains "predicate.configuration[2] is not gpuforge.dev/run" if not run_named
deny contains "predicate.configuration[2].annotations.signedAt is not at or after 2026-11-07T03:29:50+00:00" if not signed_in_time

test_result if input.predicateType == "https://in-toto.io/attestation/test-result/v0.1"

passed_or_warned if input.predicate.result in {"PASSED", "WARNED"}

no_failed_test if input.predicate.failedTests == []

in_scope if input.predicate.configuration[0].name == "gpuforge.dev/pool/h100"

validators_named if input.predicate.configuration[1].name == "gpuforge.dev/validators"

run_named if input.predicate.configuration[2].name == "gpuforge.dev/run"

signed_in_time if {
	is_string(input.predicate.configuration[2].annotations.signedAt)
	input.predicate.configuration[2].annotations.signedAt >= "2026-11-07T03:29:50+00:00"
}
