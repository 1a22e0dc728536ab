"""publish stage."""
