"""Steps that run before a profile's measurements (the storage-profile switch)."""
