"""Rendering a Snapshot at scrape time: the metric catalogue, its scopes, the collector, the exposition
encoder, content negotiation and gzip, and the DCGM-compatible names."""
