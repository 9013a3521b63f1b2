"""Private training under TensorFlow's distribution strategies.

Parameter servers (``tf.distribute.ParameterServerStrategy``) below;
mirrored replicas (``MirroredStrategy`` / ``MultiWorkerMirroredStrategy``,
noise once per global step from one shared key) in :mod:`.mirrored`.

Modules: :mod:`.cluster` (``--cluster`` parsing, loopback cluster),
:mod:`.strategy` (strategy + coordinator, table partitioner),
:mod:`tfdp_sparse.tables.shards` (global -> shard row ids, the one split), :mod:`.optimizer`
(``ShardedDPOptimizer``, ``ServerNoiseDPSGD``), :mod:`.training`
(coordinator loop with server-side step counter and Poisson batches),
:mod:`.users` (the user level: data grouped by user, users by Poisson with
at most ``k`` examples each, drawn on the worker that runs the step),
:mod:`.traffic` (loopback byte counters), :mod:`.run` (one run for the
trainers' ``--cluster`` flag); :mod:`.mirrored` (MirroredStrategy /
MultiWorkerMirroredStrategy, noise once per unique row of the global batch).
"""
