# Call D: what a warm process compiles again (goal 6).
c=/tmp/cold-qwen3-4b; T0=$(date +%s); stamp() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
find /tmp/mlx -type f | head -5; find /tmp/mlx -type f | wc -l; du -sh /tmp/mlx $c/.nv $c/dflash-mlx/cuda-kernels 2>&1; ls $c/.nv 2>&1 | head
for k in 1 2 3; do
  envs="DFLASH_ADAPTIVE_BLOCK=0"; [ $k = 3 ] && envs="DFLASH_ADAPTIVE_BLOCK=0 CUDA_CACHE_MAXSIZE=4294967296"
  before=$(find /tmp/mlx $c -type f | wc -l); stamp "run $k $envs"
  env -u MLX_PTX_CACHE_DIR XDG_CACHE_HOME="$c" HOME="$c" $envs timeout 60 "$B/dflash-mlx" run --target-model /tmp/r4b/target --draft-model /tmp/r4b/draft --prompt "hello world" -n 32 --ignore-eos --no-chat-template --stats 2>&1 >/dev/null | grep -E "generation|time split|prompt:"
  after=$(find /tmp/mlx $c -type f | wc -l); echo "files $before -> $after"; find /tmp/mlx $c -type f -newermt "-60 seconds" | head -5
done
du -sh $c/.nv 2>&1
stamp done
