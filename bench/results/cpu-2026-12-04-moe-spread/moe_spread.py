import random
random.seed(1)
E,k=256,8
def trial(rows,N,T=20000):
    tp=ep=0.0
    for _ in range(T):
        used=set()
        for _ in range(rows):
            used.update(random.sample(range(E),k))
        u=len(used)
        tp+=u/N
        # experts spread: expert e on rank e % N (contiguous blocks give the same law)
        cnt=[0]*N
        for e in used: cnt[e%N]+=1
        ep+=max(cnt)
    return tp/T, ep/T
for N in (2,4):
    for rows in (1,16):
        a,b=trial(rows,N)
        print(f"N={N} rows={rows}: split experts {a:.2f} expert-widths/rank, spread experts (busiest rank) {b:.2f}, ratio {b/a:.3f}")
