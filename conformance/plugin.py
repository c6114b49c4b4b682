"""pytest plugin entry point of the conformance suite (scenarios are added in conformance/)."""
