"""What the stages report: the lines they print, their epoch reports, their figures.

Import from here (`from mmdp.report import save_figure`); a name's module loads when it is first
used, so stage 4's figures do not pull torch.

plots        the figures of stages 1-4 and what every figure shares (colours, save_figure)
model_plots  the figures of stages 5-6
printing     a batch, a table, the settings, an epoch's report
epoch        one epoch through a loader into a report; --metrics-json, --save-batch
metrics      EpochReport: utilization and dropped samples over an epoch
pack_report  PackReport: stage 5's, per pack and per source; merged over ranks (rank_balance);
             the JSON
sources      source_report(): each source of a mixture, asked vs realised, and its drops
"""

from mmdp._lazy import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "mmdp.report.plots": [
            "save_figure",
            "display_path",
            "plot_sample",
            "plot_padding",
            "plot_padding_side_by_side",
            "plot_packs",
            "waste",
            "waste_title",
        ],
        "mmdp.report.model_plots": [
            "plot_pack_samples",
            "plot_strategies",
            "plot_learning_curves",
        ],
        "mmdp.report.printing": [
            "print_settings",
            "print_run_settings",
            "print_batch",
            "print_table",
            "print_weighing",
            "print_epoch_report",
            "print_rank_balance",
        ],
        "mmdp.report.epoch": ["run_epoch", "run_packed_epoch", "nothing_to_do", "write_outputs"],
        "mmdp.report.metrics": ["EpochReport", "write_json"],
        "mmdp.report.pack_report": [
            "PackReport",
            "merge_over_ranks",
            "epoch_metrics",
            "rank_balance",
        ],
        "mmdp.report.sources": ["source_report", "format_source_report"],
    },
)
