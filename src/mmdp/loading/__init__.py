"""Loading: the planned packs built into batches, in DataLoader workers, for a trainer.
The batch they yield is mmdp.batch's contract (build_pack, collate_packs).

constant_length ConstantLengthDataset: stage 5 as the blog writes it, packed as it reads
packed_dataset  PackedDataset, PackedDataLoader: mmdp's own, planned up front
background      iterate_in_background(): the blog's producer-consumer thread, done safely
workers         a failed DataLoader worker named in one sentence
guards          why the loaders refuse to be wrapped by another loader
streaming       StreamingPackedDataset, StreamingDataLoader: stage 5 from a stream
"""
