"""The report: every figure (figures), the bench tables (tables), a job folder's artifacts (folder) and the one
self-contained HTML page (html)."""
