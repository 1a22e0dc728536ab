"""registry room: the door to registries: images by ImageRef (client, through skopeo) and the signed statements
about them (attest, through cosign). Publishing, the CVE gate and the fleet's reports all go through it."""
