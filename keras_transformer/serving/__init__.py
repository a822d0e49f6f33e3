"""The exported translator: its module (`translator`), the export writer (`export`,
`export_folder`, `ctranslate2_export`), op checks and self-check, and what runs it
(`runners`, on the artifact a path names: `artifacts`; LiteRT's set-up: `litert`)."""
