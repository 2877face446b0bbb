"""What the stages report: the lines they print, their epoch reports, their figures.

plots        the figures of stages 1-4 and what every figure shares (colours, save_figure)
model_plots  the figures of stages 5-6
printing     a batch, a table, the settings, an epoch's report
epoch        one epoch through a loader into a report; --metrics-json, --save-batch
metrics      EpochReport: utilization and dropped samples over an epoch
pack_report  PackReport: stage 5's, per pack and per source; merged over ranks (rank_balance);
             the JSON
sources      source_report(): each source of a mixture, asked vs realised, and its drops

The face below holds the names stage 6 and examples/group_by_length.py import from here; a name's
module loads when it is first used, so a figure of stage 4 does not pull torch.
"""

from mmdp._lazy import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "mmdp.report.plots": ["save_figure", "display_path", "waste_title"],
        "mmdp.report.model_plots": ["plot_strategies", "plot_learning_curves"],
        "mmdp.report.printing": ["print_settings", "print_batch", "print_table"],
        "mmdp.report.epoch": ["run_epoch", "nothing_to_do"],
        "mmdp.report.metrics": ["EpochReport", "write_json"],
        "mmdp.report.pack_report": ["rank_balance"],
    },
)
