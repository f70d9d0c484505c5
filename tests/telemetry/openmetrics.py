"""Reads a metrics page on stdin with the Prometheus client's strict OpenMetrics parser and
prints its samples as one JSON list of {"name", "labels", "value"}; exits non-zero (with the
parser's message) when the page is not valid OpenMetrics text."""

import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families


def main() -> None:
    page = sys.stdin.read()
    samples = []
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            samples.append(
                {"family": family.name, "type": family.type, "name": s.name, "labels": s.labels, "value": s.value}
            )
    json.dump(samples, sys.stdout)


if __name__ == "__main__":
    main()
