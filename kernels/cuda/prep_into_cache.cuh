// Selects head_prep_head.cuh's variant that reads one merged product y and writes the keys
// and values into the KV cache's buffers ck / cv in place (HeadPrepInto, KVPrepInto).
#define DFLASH_PREP_INTO_CACHE 1
