"""`specloop reproduce`: run every part (theory check, simulations, real-model runs,
figures), each into DIR/<part>/ with a done-marker, and write DIR/report.md with the
tables, the figures, a verdict per stated result of the papers and the machine.

Modules: `machine` (platform and versions), `parts` (the parts and their resumable
runner), `verdicts` (claims computed from the parts' numbers), `writer` (report.md).
"""
