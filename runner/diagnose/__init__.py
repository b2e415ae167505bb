"""Why a rank failed, in words: out of memory, killed by the kernel, a lost peer, a full disk."""
