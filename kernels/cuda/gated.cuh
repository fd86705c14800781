
template <typename T>
__device__ __forceinline__ T dflash_gated(float g, float u) {
  const float s = static_cast<float>(static_cast<T>(1.0f / (1.0f + expf(-g))));
  const float a = static_cast<float>(static_cast<T>(g * s));
  return static_cast<T>(a * u);
}
