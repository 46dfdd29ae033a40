"""The site hook's directives, one module per kind (docs/hooks/course_site.py dispatches)."""
