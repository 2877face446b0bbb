"""One word per idea, where a name used to mean two things: `batch_size` is samples per padded
batch and `packs_per_batch` packs per packed one; what resumes is a `state_dict()`, the loader's
(a PackedDataset has none of its own) and a stream reader's."""

from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.vqa_dataset import VQADataset
from mmdp.loading.packed_dataset import PackedDataLoader, PackedDataset
from mmdp.packing.packing_config import PackingConfig
from mmdp.packing.weights import Weights
from mmdp.training.strategies import compare_strategies

# Lengths [3, 6, 2, 5], budget 8: binpack makes [[6, 2], [5, 3]], 2 packs; 4 samples.
WEIGHTS = Weights.from_lists([3, 6, 2, 5], [0, 0, 0, 0])


def batches(**sizes) -> dict:
    results = compare_strategies(WEIGHTS, max_length=8, max_images=4, seed=0, **sizes)
    return {name: r["batches"] for name, r in results.items()}


def test_batch_size_counts_samples_and_packs_per_batch_counts_packs():
    # 4 samples, 2 a padded batch: 2 batches; 2 packs, 1 a packed batch: 2 batches
    assert batches(batch_size=2, packs_per_batch=1)["naive"] == 2
    assert batches(batch_size=2, packs_per_batch=1)["binpack"] == 2
    # 2 packs a packed batch: 1 batch, whatever batch_size says
    assert batches(batch_size=2, packs_per_batch=2)["binpack"] == 1
    assert batches(batch_size=1, packs_per_batch=2)["naive"] == 4


def test_what_resumes_is_the_loaders_state_dict(tokenizer):
    samples = VQADataset(load_vqa_dataset(num_rows=40), tokenizer, image_size=16)
    dataset = PackedDataset(samples, config=PackingConfig(max_length=512, packs_per_batch=2))
    loader = PackedDataLoader(dataset, num_workers=0)
    next(iter(loader))
    state = loader.state_dict()
    assert state == {**dataset.settings(), "epoch": 0, "batches_done": 1}
    resumed = PackedDataLoader(PackedDataset(samples, config=dataset.config), num_workers=0)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    for old in ("state", "resume_at"):
        assert not hasattr(dataset, old)
