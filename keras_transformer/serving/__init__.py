"""The exported translator: its module (`translator`), the export writer (`export`,
`export_folder`, `ctranslate2_export`), op checks and self-check, what runs it
(`runners`, on the artifact a path names: `artifacts`; LiteRT's set-up: `litert`), and
the HTTP server of `serve` (`server`, with TF Serving's REST API in `rest_api` and
batching across requests in `batching`)."""
