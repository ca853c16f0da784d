// Mutual recursion: a recursive-descent evaluator of arithmetic expressions
// stored as tokens (expr -> term -> factor -> '(' expr ')').
enum Tok { NUM, PLUS, MINUS, STAR, SLASH, LPAREN, RPAREN, END };

struct Token {
  Tok kind;
  int value;
};

struct Cursor {
  const Token *toks;
  int pos;
};

__device__ int eval_expr(Cursor &c);

__device__ int eval_factor(Cursor &c) {
  Token t = c.toks[c.pos++];
  if (t.kind == NUM) return t.value;
  if (t.kind == MINUS) return -eval_factor(c);
  int v = eval_expr(c);  // t.kind == LPAREN
  c.pos++;               // RPAREN
  return v;
}

__device__ int eval_term(Cursor &c) {
  int v = eval_factor(c);
  while (c.toks[c.pos].kind == STAR || c.toks[c.pos].kind == SLASH) {
    Tok op = c.toks[c.pos++].kind;
    int r = eval_factor(c);
    v = op == STAR ? v * r : (r ? v / r : 0);
  }
  return v;
}

__device__ int eval_expr(Cursor &c) {
  int v = eval_term(c);
  while (c.toks[c.pos].kind == PLUS || c.toks[c.pos].kind == MINUS) {
    Tok op = c.toks[c.pos++].kind;
    int r = eval_term(c);
    v = op == PLUS ? v + r : v - r;
  }
  return v;
}

__global__ void evalExpressions(const Token *const *exprs, int *results, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  Cursor c{exprs[i], 0};
  results[i] = eval_expr(c);
}

void evaluate(const Token *const *exprs, int *results, int n) {
  evalExpressions<<<(n + 127) / 128, 128>>>(exprs, results, n);
}
