"""Where the dashboard's numbers come from: the :class:`~dashboard.sources.source.MetricSource`
protocol and its two answers, Prometheus' HTTP API (prometheus, prometheus_auth) and scraping the
exporters directly (scrape, scrape_history, scrape_verdicts); openmetrics writes a history for
Prometheus to backfill."""
