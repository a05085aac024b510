"""The admin web UI (``/ui``): Jinja2 pages over the REST API, htmx for the live parts, no build step."""
