"""The volume-class emulation on one machine: a class's IOPS and throughput as the kernel's
block-I/O limits (:mod:`~localcluster.emulation.io_limits`), on a loop-device volume in RAM
that nothing else uses (:mod:`~localcluster.emulation.loop_volume`), for the profiles the
sandbox's claim switches between (:mod:`~localcluster.emulation.sandbox_profiles`).

It sits in the local cluster, not in the shared base, because only the local runtimes use it:
the sandbox's claim and agent, the local node (its CSI driver's volumes follow
``loop_volume``'s naming, so one sweep finds them, and the driver's throttle follows
``io_limits``' rules, checked against one table: ``localcluster/throttle_vectors.json``), and
the local modes of two parts: the hook's ``--backend local`` (the sandbox's switch) and the
verdict's calibration on the emulated classes. On a cluster the provider does all of this.
"""
