"""Switch a claim's VolumeAttributesClass (or a sandbox profile) and wait until it settled.

Run as ``python -m hooks.storage_profile switch|status``; see ``docs/storage-profile.md``.
"""
