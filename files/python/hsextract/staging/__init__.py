"""The staged dump contract: what lies in the staging directory (/dev/shm) between the capture, the
client and the drain.

One room for everything that is written on one side of the RAM disk and read on the other:

* `dumps`: a request's staged states and its ``done.json`` / ``failed.json`` marker, written by
  the capture, read by the drain;
* `records`: the client's record of each sample (``_records/<rid>.json``) and the request id that
  names it;
* `announcements`: each capture's note of what it writes and how (``_captures/<host>-<pid>.json``);
* `names`: the staging directory's file names, the one place they are spelled;
* `fs`: making and opening anything there without trusting what another user left;
* `room`: the space a run's staged requests need there (``hsextract check-shm``, ``hsextract plan``).

The output directory, where the drain puts the training set, is `hsextract.output`.
"""
