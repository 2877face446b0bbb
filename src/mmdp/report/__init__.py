"""What the stages report.

metrics   EpochReport, PackReport: utilization and dropped samples over an epoch; rank balance
plots     the figures under assets/
"""
