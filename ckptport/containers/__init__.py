"""Container formats, parsed strictly and without torch: one parse per container.

``sniff`` tells a file's container from its bytes (and refuses files that
are two containers at once); ``zipfmt`` parses torch zip archives,
``legacy`` the non-zip torch layout, ``safetensors`` the safetensors header,
``shard_index`` a Hugging Face shard index. Readers describe and read
tensors from these parses, so the torch-free path and the torch path start
from the same facts.
"""
