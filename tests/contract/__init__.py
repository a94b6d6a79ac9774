"""Contract tests: the public API's behaviour, on every available backend where a test says so."""
