"""What the stages report.

metrics   EpochReport, PackReport: utilization and dropped samples over an epoch; rank balance
sources   source_report(): each source of a mixture, asked vs realised, and its drops
plots     the figures under assets/
"""
