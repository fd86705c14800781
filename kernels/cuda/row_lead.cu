
  int a = 0;
  while (a < match_shape[0] && match[a]) ++a;
  accepted[0] = a;
  tok[0] = next[a];
