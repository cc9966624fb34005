"""The draft vocabulary: how often each token is trained on, and each trainer's mapping files.

EAGLE-3 drafters predict over a reduced vocabulary, the N tokens the training set trains on most
(loss-masked tokens only: ``input_ids[loss_mask == 1]``). The drain counts them as it commits
samples (`tracker`), keeps the counts in a checkpoint that always matches the manifest after any
crash (`checkpoint`), and at finalize writes each trainer's files (`files`) from the same
selection (`mapping`). The flags that set it are one definition for every command that writes it
(`arguments`).
"""
