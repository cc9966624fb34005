"""The output directory: the training set and every file beside it, one owner for each.

The client, the drain, collect, the fleet, ``hsextract status`` and the roles all read or write
it; each goes through this package:

* `layout`: every file name inside an output directory;
* `manifest`: the set's header and its one line per written sample;
* `commit`: the ordered commit of samples into the set (rename, fsync, manifest line), for the
  drain and collect, with what a full volume does passed in;
* `repair`: what a killed writer left (a torn manifest line, orphan sample files, temporary
  files), put right at the drain's and collect's start;
* `run_id`: the output's run id, created once, carried by every request id;
* `lock`: one writer per output, one client per shard, locks that die with their holder;
* `client_files`: the clients' status and summary files, read together across shards;
* `run_files`: the run's status files typed (the client's status and summary, the drain's status),
  one reader and one writer each, and `read_json_object`;
* `dataset_record`: which dataset the set is extracted from, and the refusal to resume another;
* `accounts`: every sample accounted for (accepted = in the set + failed + quarantined);
* `finalized`: whether the dataset-level files are in step with the manifest.
"""
