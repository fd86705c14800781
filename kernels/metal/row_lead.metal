  // The twin of cuda/row_lead.cu: one thread, grid (1, 1, 1); accepted = the number of
  // leading true values of match [n], tok = next[accepted] (next [n+1]).
  int a = 0;
  while (a < match_shape[0] && match[a]) ++a;
  accepted[0] = a;
  tok[0] = next[a];
