"""DataSettings: the rows a run reads, as one value the scripts build from their flags."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """The rows a run reads, named as the data flags are (add_data_args): a script's own are
    `settings_of(DataSettings, args)`; `load()` reads them, `stream()` reads them as a stream."""

    dataset: str | None = None  # None: the embedded synthetic dataset
    subset: str | None = None
    split: str = "train"
    num_rows: int | None = None  # None: every row
    image_root: str | None = None
    format: str | None = None  # None: told from the columns
    columns: dict[str, str] | None = None  # {"old": "new"}: renamed first (ms-swift's --columns)

    def load(self):
        """The rows, in the_cauldron's schema (mmdp.data.reading.sources.load_vqa_dataset)."""
        from mmdp.data.reading.sources import load_vqa_dataset

        return load_vqa_dataset(**self.reader_arguments())

    def stream(self):
        """The same rows as a datasets.IterableDataset (mmdp.data.reading.stream.load_vqa_stream)."""
        from mmdp.data.reading.stream import load_vqa_stream

        return load_vqa_stream(**self.reader_arguments())

    def reader_arguments(self) -> dict:
        """The keywords both readers take: the fields, the dataset's under its reader's name."""
        fields = dataclasses.asdict(self)
        return {"name_or_path": fields.pop("dataset"), **fields}
