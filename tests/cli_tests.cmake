# CLI contract tests. STUB
