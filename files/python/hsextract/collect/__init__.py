"""``hsextract collect``: many hosts' training sets brought into one, verified.

A fleet run gives each host a shard i/N of the dataset, and each host's drain writes its own
training set. Collect makes them one, on a collector host or a shared volume::

    hsextract collect --into /data/collected [--link | --move] [--final] a=/staging/a b=/staging/b ...

* what belongs together (`identity`, `admit`): the same model, layers, norm placement, format,
  dtype, hidden size, dataset and run; a host output that differs is refused by name and field;
* what to fetch (`plan`): the samples the collected set lacks, in dataset-index order, numbered
  after the ones it has; each sample's file is renamed only, its bytes and checksum unchanged;
* how (`transfer`, `failures`, `space`): copy, hard link or move, re-hashed against the host's
  manifest in the collected set and checked to be the row's sample
  (hsextract.formats.sample_check); a host's paths are opened only inside its output, never
  through a link (hsextract.contained); fetched again once when a read fails, else listed with
  its reason; committed in order by the drain's own ordered commit (hsextract.output.commit:
  rename, then the manifest line) and repaired at start by its repair (hsextract.output.repair),
  so kill -9 at any instant and run again gives the same set; a full volume stops the collect
  or, with ``--wait-for-space``, waits;
* the fleet's accounts (`accounts`, `shards`): every host's reconciliation and the fleet's, and
  whether the shards cover the dataset exactly once;
* the set's own files (`finalize`, `vocab`, `bookkeeping`, `card`): the format's dataset-level
  files, the draft vocabulary of the summed counts, merged rejects and failures, the card;
* where (`into`): a new or empty directory or a set collect made, nothing else; a collect that
  admits no host changes nothing there.

Hosts on other machines are pulled by rsync into a local staging directory per host first
(``playbooks/collect.yml``); collect itself reads local paths only.
"""
