//! Block hashes: the names of page-aligned prompt prefixes that workers report in
//! `cache_events` (docs/protocol.md). Block i of a prompt is tokens `[i*P, (i+1)*P)` for the
//! worker's page size P; its hash chains the previous block's (0 before the first):
//!
//! `h_i = u64_le(sha256(u64_le(h_{i-1}) ‖ u32_le(t) for t in block i)[0..8])`
//!
//! so a hash names the whole prefix up to its block's end. The worker computes the same in
//! python/minisgl_worker/kvcache/blocks.py; the golden vectors tie the two together.

use sha2::{Digest, Sha256};

/// The hash of every whole page of `ids`, in order (a partial last page has none).
pub fn block_hashes(ids: &[u32], page_size: usize) -> Vec<u64> {
    assert!(page_size >= 1, "page_size must be >= 1");
    let mut parent = 0u64;
    ids.chunks_exact(page_size)
        .map(|block| {
            let mut hasher = Sha256::new();
            hasher.update(parent.to_le_bytes());
            for t in block {
                hasher.update(t.to_le_bytes());
            }
            let digest = hasher.finalize();
            parent = u64::from_le_bytes(digest[..8].try_into().expect("8 of 32 bytes"));
            parent
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_names_the_whole_prefix() {
        let a = block_hashes(&[1, 2, 3, 4, 5, 6, 7], 2);
        assert_eq!(a.len(), 3, "the partial last page has no hash");
        let b = block_hashes(&[1, 2, 3, 4, 9, 9], 2);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        let same_tokens = block_hashes(&[7, 7, 7], 1);
        assert_ne!(
            same_tokens[0], same_tokens[1],
            "same block, different prefix"
        );
        assert!(block_hashes(&[1], 4).is_empty());
    }
}
