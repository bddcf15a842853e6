# dsl/build.mk - the model language front end: lexer, grammar, AST (one entry per line).
