"""Each row's pre-computed tokens (pretokenize=True), read as numpy views of their Arrow buffers.

The weighing pass keeps every row's input_ids and labels in a Dataset of two list columns,
memory-mapped from the weights' cache (mmdp.weighing.weigh) or from a prepared dataset. A
pack needs the tokens of a few rows; reading them through datasets' formatting cost a DataLoader
worker about 5x what slicing the same buffers does (0.20 against 0.04 s for the 490 packs of
2,000 embedded rows; docs/benchmarks.md, "The loader at the decode floor"). A list column is
stored as one flat array of every row's values and an array of where each row starts (its
offsets), in a few chunks:

    input_ids values   [1, 5, 9, 2, 7, 3, 3]      offsets [0, 3, 5, 7]
    row 1 -> values[3:5] = [2, 7]
"""

import bisect

import numpy as np
import pyarrow as pa
from datasets import Dataset

COLUMNS = ("input_ids", "labels")


class RowTokens:
    """`row_tokens[row]` -> (input_ids, labels) of that row: int32 numpy views of the memory-
    mapped data, not copies (read-only). Pickles as its Dataset (a reference to the Arrow file,
    as datasets pickles it): a DataLoader worker started with spawn maps the same file."""

    def __init__(self, tokens: Dataset):
        if tokens._indices is not None:  # a select() or shuffle() of the rows: write them in order
            tokens = tokens.flatten_indices()
        self.tokens = tokens
        self.columns = [ListColumn(tokens.data.column(name)) for name in COLUMNS]

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} of {len(self)} rows of tokens")
        input_ids, labels = (column[row] for column in self.columns)
        return input_ids, labels

    def __getstate__(self) -> dict:
        return {"tokens": self.tokens}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["tokens"])


class ListColumn:
    """One list column of an Arrow table, `column[row]` that row's list as a numpy view. Each
    chunk is kept as its flat values and its offsets (one per row of the chunk, and one more); a
    chunk sliced from a larger array keeps its values whole and its offsets where the slice
    starts (pyarrow's `offsets`). Each column has its own chunks: two columns of one table need
    not be cut in the same places."""

    def __init__(self, column: pa.ChunkedArray):
        self.chunks = [
            (chunk.values.to_numpy(zero_copy_only=True), chunk.offsets.to_numpy())
            for chunk in column.chunks
        ]
        self.chunk_starts = np.cumsum([0, *(len(chunk) for chunk in column.chunks)]).tolist()

    def __getitem__(self, row: int) -> np.ndarray:
        chunk = bisect.bisect_right(self.chunk_starts, row) - 1
        values, offsets = self.chunks[chunk]
        at = row - self.chunk_starts[chunk]
        return values[offsets[at] : offsets[at + 1]]
