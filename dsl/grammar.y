/*
 * grammar.y - grammar of the model language (dsl/README.md is the reference).
 *
 * Pure reentrant parser with locations (CONVENTIONS.md item 8): %expect 0 (conflicts are
 * resolved with precedence, never by raising the count), detailed error messages, recovery at
 * ';' and '}' through `error` productions, and every action is one call to an ms_ast_* builder.
 * Analysis (names, types, shapes, resources) happens later, in compiler/sema.c.
 *
 * Memory: semantic values and the parser stacks live in the compilation's arena (YYMALLOC);
 * the %destructor only counts values dropped by error recovery.
 * Lists are left-recursive so long lists do not grow the parser stack.
 */
%require "3.5"
%define api.pure full
%define api.prefix {ms_dsl_yy}
%define api.location.type {ms_loc}
%define parse.error detailed
%locations
%expect 0
%param {ms_parse_ctx *ctx}

%code requires {
#include "parse_impl.h"
typedef void *yyscan_t;
}

%code provides {
int ms_dsl_yylex(MS_DSL_YYSTYPE *yylval, ms_loc *yylloc, ms_parse_ctx *ctx);
/* The flex scanner (lexer.l), renamed so the parser's yylex can take the parse context. */
int ms_dsl_yylex_impl(MS_DSL_YYSTYPE *yylval, ms_loc *yylloc, void *scanner);
}

%code {
#include <string.h>

#include "print.h"
#include "dsl_lex.h"

#define YYMALLOC(n) ms_arena_alloc(ctx->arena, (n))
#define YYFREE(p) ((void)(p))
/* Deep nesting is reported as a syntax error instead of growing the stack (and every later
 * recursive pass) without bound. */
#define YYMAXDEPTH 2000
#define YYINITDEPTH 200

static void ms_dsl_yyerror(const ms_loc *loc, ms_parse_ctx *ctx, const char *msg);
}

%union {
    int64_t ival;
    double fval;
    const char *str;
    bool flag;
    ms_op op;
    ms_ast_expr *expr;
    ms_ast_arg *arg;
    ms_ast_ident *ident;
    ms_ptr_vec *vec;
    ms_ast_param *param;
    ms_ast_weight *weight;
    ms_ast_node *node;
    ms_ast_step *step;
    ms_ast_step_item *sitem;
    ms_ast_segment *seg;
    ms_ast_stmt *stmt;
    ms_ast_fparam *fparam;
    ms_ast_forward *forward;
    ms_ast_walk *walk;
    ms_ast_walk_item *witem;
}

%token T_EOF 0 "end of file"
%token <str> T_IDENT "identifier"
%token <str> T_STRING "string"
%token <ival> T_INT "integer"
%token <fval> T_FLOAT "number"
%token T_MODEL "model" T_CONFIG "config" T_WEIGHTS "weights" T_NODE "node"
%token T_RESOURCE "resource" T_LABELS "labels" T_STEP "step" T_SEGMENTS "segments"
%token T_CAPTURE "capture" T_FORWARD "forward" T_WALK "walk" T_FOR "for" T_IN "in"
%token T_RETURN "return" T_LET "let" T_FROM "from" T_OR "or" T_IF "if"
%token T_OPTIONAL "optional" T_THEN "then" T_LOOP "loop" T_UNTIL "until"
%token T_TRUE "true" T_FALSE "false" T_NONE "none" T_IGNORE "ignore"
%token T_ARROW "->" T_DOTDOT ".." T_PLUSEQ "+=" T_EQ "==" T_NE "!=" T_LE "<=" T_GE ">="
%token T_ANDAND "&&" T_OROR "||"

%type <expr> expr primary opt_default opt_tie_cond
%type <arg> arg field
%type <ident> ident opt_ident type
%type <vec> args opt_args exprs opt_sources strings config_items weight_items
%type <vec> names idents opt_idents fields segments fparams opt_fparams stmts block
%type <flag> opt_question opt_let opt_optional
%type <param> param
%type <weight> weight opt_weight_suffix
%type <node> node_items
%type <step> step
%type <sitem> step_item
%type <vec> step_items
%type <seg> segment
%type <stmt> stmt
%type <fparam> fparam
%type <forward> forward
%type <walk> walk
%type <witem> walk_seq walk_item

%destructor { ms_ast_discard(ctx, $$); } <expr> <arg> <ident> <vec> <param> <weight> <node>
%destructor { ms_ast_discard(ctx, $$); } <step> <sitem> <seg> <stmt> <fparam> <forward> <walk>
%destructor { ms_ast_discard(ctx, $$); } <witem> <str>

%right '?' ':'
%left T_OROR
%left T_ANDAND
%nonassoc T_ARROW
%nonassoc T_EQ T_NE '<' T_LE '>' T_GE
%nonassoc T_DOTDOT
%left '+' '-'
%left '*' '/' '%'
%precedence UNARY

%%

file
    : T_MODEL ident '{' model_items '}'  { ms_ast_model_finish(ctx, @$, $2); }
    ;

model_items
    : %empty
    | model_items T_CONFIG '{' config_items '}'    { ms_ast_model_add_params(ctx, $4); }
    | model_items T_WEIGHTS '{' weight_items '}'   { ms_ast_model_add_weights(ctx, $4); }
    | model_items T_NODE ident '{' node_items '}'  { ms_ast_model_add_node(ctx, ms_ast_node_finish(ctx, $5, @$, $3)); }
    | model_items walk                             { ms_ast_model_add_walk(ctx, $2); }
    | model_items error '}'
    | model_items error ';'
    ;

/* ---- config ---- */

config_items
    : %empty                        { $$ = ms_ast_vec(ctx); }
    | config_items param            { $$ = ms_ast_vec_push(ctx, $1, $2); }
    | config_items error ';'        { $$ = $1; }
    ;

param
    : opt_let ident ':' type opt_question opt_default opt_sources ';'
                                    { $$ = ms_ast_param_new(ctx, @$, $1, $2, $4, $5, $6, $7); }
    ;

type
    : ident                         { $$ = $1; }
    | ident '[' ']'                 { $$ = ms_ast_list_type(ctx, @$, $1); }
    ;

opt_let
    : %empty                        { $$ = false; }
    | T_LET                         { $$ = true; }
    ;

opt_question
    : %empty                        { $$ = false; }
    | '?'                           { $$ = true; }
    ;

opt_default
    : %empty                        { $$ = NULL; }
    | '=' expr                      { $$ = $2; }
    ;

opt_sources
    : %empty                        { $$ = ms_ast_vec(ctx); }
    | T_FROM strings                { $$ = $2; }
    ;

strings
    : T_STRING                      { $$ = ms_ast_vec1(ctx, ms_ast_string(ctx, @1, $1)); }
    | strings ',' T_STRING          { $$ = ms_ast_vec_push(ctx, $1, ms_ast_string(ctx, @3, $3)); }
    ;

/* ---- weights ---- */

weight_items
    : %empty                        { $$ = ms_ast_vec(ctx); }
    | weight_items weight           { $$ = ms_ast_vec_push(ctx, $1, $2); }
    | weight_items T_IGNORE strings ';'
                                    { $$ = ms_ast_vec_push(ctx, $1, ms_ast_weight_ignore(ctx, @2, $3)); }
    | weight_items error ';'        { $$ = $1; }
    ;

weight
    : ident '=' names '[' exprs ']' opt_weight_suffix ';'
                                    { $$ = ms_ast_weight_tensor(ctx, @$, $1, $3, $5, $7); }
    | ident '[' ident '<' expr ']' '{' weight_items '}'
                                    { $$ = ms_ast_weight_group(ctx, @$, $1, $3, $5, $8); }
    ;

names
    : T_STRING                      { $$ = ms_ast_vec1(ctx, ms_ast_string(ctx, @1, $1)); }
    | names '|' T_STRING            { $$ = ms_ast_vec_push(ctx, $1, ms_ast_string(ctx, @3, $3)); }
    ;

opt_weight_suffix
    : opt_optional                          { $$ = ms_ast_weight_suffix(ctx, NULL, NULL, $1); }
    | T_OR ident opt_tie_cond opt_optional  { $$ = ms_ast_weight_suffix(ctx, $2, $3, $4); }
    ;

opt_tie_cond
    : %empty                        { $$ = NULL; }
    | T_IF expr                     { $$ = $2; }
    ;

opt_optional
    : %empty                        { $$ = false; }
    | T_OPTIONAL                    { $$ = true; }
    ;

/* ---- nodes ---- */

node_items
    : %empty                        { $$ = ms_ast_node_new(ctx); }
    | node_items T_LABELS idents ';'
                                    { $$ = ms_ast_node_add_labels(ctx, $1, $3); }
    | node_items T_RESOURCE ident '=' expr ';'
                                    { $$ = ms_ast_node_add_resource(ctx, $1, @$, $3, $5); }
    | node_items step               { $$ = ms_ast_node_add_step(ctx, $1, $2); }
    | node_items forward            { $$ = ms_ast_node_add_forward(ctx, $1, $2); }
    | node_items error ';'          { $$ = $1; }
    | node_items error '}'          { $$ = $1; }
    ;

idents
    : ident                         { $$ = ms_ast_vec1(ctx, $1); }
    | idents ',' ident              { $$ = ms_ast_vec_push(ctx, $1, $3); }
    ;

opt_idents
    : %empty                        { $$ = ms_ast_vec(ctx); }
    | idents                        { $$ = $1; }
    ;

step
    : T_STEP ident '(' opt_idents ')' '{' step_items '}'
                                    { $$ = ms_ast_step_new(ctx, @$, $2, $4, $7); }
    ;

step_items
    : %empty                        { $$ = ms_ast_vec(ctx); }
    | step_items step_item          { $$ = ms_ast_vec_push(ctx, $1, $2); }
    | step_items error ';'          { $$ = $1; }
    ;

step_item
    : T_SEGMENTS segments ';'       { $$ = ms_ast_step_segments(ctx, @$, $2); }
    | T_CAPTURE ident T_IN '[' exprs ']' ';'
                                    { $$ = ms_ast_step_capture(ctx, @$, $2, $5); }
    | ident ';'                     { $$ = ms_ast_step_record(ctx, @$, $1, ms_ast_vec(ctx)); }
    | ident fields ';'              { $$ = ms_ast_step_record(ctx, @$, $1, $2); }
    ;

segments
    : segment                       { $$ = ms_ast_vec1(ctx, $1); }
    | segments ',' segment          { $$ = ms_ast_vec_push(ctx, $1, $3); }
    ;

segment
    : ident T_PLUSEQ expr           { $$ = ms_ast_segment_new(ctx, $1, $3); }
    ;

fields
    : field                         { $$ = ms_ast_vec1(ctx, $1); }
    | fields ',' field              { $$ = ms_ast_vec_push(ctx, $1, $3); }
    ;

field
    : T_IDENT                       { $$ = ms_ast_field(ctx, @1, $1, NULL); }
    | T_IDENT '=' expr              { $$ = ms_ast_field(ctx, @1, $1, $3); }
    ;

forward
    : T_FORWARD opt_ident '(' opt_fparams ')' T_ARROW ident block
                                    { $$ = ms_ast_forward_new(ctx, @$, $2, $4, $7, $8); }
    ;

opt_ident
    : %empty                        { $$ = NULL; }
    | ident                         { $$ = $1; }
    ;

opt_fparams
    : %empty                        { $$ = ms_ast_vec(ctx); }
    | fparams                       { $$ = $1; }
    ;

fparams
    : fparam                        { $$ = ms_ast_vec1(ctx, $1); }
    | fparams ',' fparam            { $$ = ms_ast_vec_push(ctx, $1, $3); }
    ;

fparam
    : ident                         { $$ = ms_ast_fparam_new(ctx, $1, NULL); }
    | ident ':' '[' exprs ']'       { $$ = ms_ast_fparam_new(ctx, $1, $4); }
    | ident ':' '[' exprs ']' ident { $$ = ms_ast_fparam_new(ctx, $1, $4); $$->elem = *$6; }
    ;

block
    : '{' stmts '}'                 { $$ = $2; }
    ;

stmts
    : %empty                        { $$ = ms_ast_vec(ctx); }
    | stmts stmt                    { $$ = ms_ast_vec_push(ctx, $1, $2); }
    | stmts error ';'               { $$ = $1; }
    | stmts error '}'               { $$ = $1; }
    ;

stmt
    : exprs '=' exprs ';'           { $$ = ms_ast_stmt_assign(ctx, @$, $1, $3); }
    | exprs ';'                     { $$ = ms_ast_stmt_expr(ctx, @$, $1); }
    | T_FOR ident T_IN ident block  { $$ = ms_ast_stmt_for(ctx, @$, $2, $4, $5); }
    | T_FOR ident T_IN ident ident expr block
                                    { $$ = ms_ast_stmt_for_at(ctx, @$, $2, $4, $5, $6, $7); }
    | T_RETURN exprs ';'            { $$ = ms_ast_stmt_return(ctx, @$, $2); }
    ;

/* ---- walks ---- */

walk
    : T_WALK ident '=' walk_seq ';' { $$ = ms_ast_walk_new(ctx, @$, $2, $4); }
    ;

walk_seq
    : walk_item                     { $$ = $1; }
    | walk_seq T_THEN walk_item     { $$ = ms_ast_walk_seq(ctx, @$, $1, $3); }
    ;

walk_item
    : ident '.' ident               { $$ = ms_ast_walk_step(ctx, @$, $1, $3); }
    | T_LOOP walk_seq T_UNTIL ident { $$ = ms_ast_walk_loop(ctx, @$, $2, $4); }
    | '(' walk_seq ')'              { $$ = $2; }
    ;

/* ---- expressions ---- */

exprs
    : expr                          { $$ = ms_ast_vec1(ctx, $1); }
    | exprs ',' expr                { $$ = ms_ast_vec_push(ctx, $1, $3); }
    ;

expr
    : primary                       { $$ = $1; }
    | '-' expr %prec UNARY          { $$ = ms_ast_unary(ctx, @$, MS_OP_NEG, $2); }
    | '!' expr %prec UNARY          { $$ = ms_ast_unary(ctx, @$, MS_OP_NOT, $2); }
    | expr '+' expr                 { $$ = ms_ast_binary(ctx, @$, MS_OP_ADD, $1, $3); }
    | expr '-' expr                 { $$ = ms_ast_binary(ctx, @$, MS_OP_SUB, $1, $3); }
    | expr '*' expr                 { $$ = ms_ast_binary(ctx, @$, MS_OP_MUL, $1, $3); }
    | expr '/' expr                 { $$ = ms_ast_binary(ctx, @$, MS_OP_DIV, $1, $3); }
    | expr '%' expr                 { $$ = ms_ast_binary(ctx, @$, MS_OP_MOD, $1, $3); }
    | expr T_EQ expr                { $$ = ms_ast_binary(ctx, @$, MS_OP_EQ, $1, $3); }
    | expr T_NE expr                { $$ = ms_ast_binary(ctx, @$, MS_OP_NE, $1, $3); }
    | expr '<' expr                 { $$ = ms_ast_binary(ctx, @$, MS_OP_LT, $1, $3); }
    | expr T_LE expr                { $$ = ms_ast_binary(ctx, @$, MS_OP_LE, $1, $3); }
    | expr '>' expr                 { $$ = ms_ast_binary(ctx, @$, MS_OP_GT, $1, $3); }
    | expr T_GE expr                { $$ = ms_ast_binary(ctx, @$, MS_OP_GE, $1, $3); }
    | expr T_ANDAND expr            { $$ = ms_ast_binary(ctx, @$, MS_OP_AND, $1, $3); }
    | expr T_OROR expr              { $$ = ms_ast_binary(ctx, @$, MS_OP_OR, $1, $3); }
    | expr T_ARROW expr             { $$ = ms_ast_binary(ctx, @$, MS_OP_ARROW, $1, $3); }
    | expr T_DOTDOT expr            { $$ = ms_ast_binary(ctx, @$, MS_OP_RANGE, $1, $3); }
    | expr '?' expr ':' expr        { $$ = ms_ast_cond(ctx, @$, $1, $3, $5); }
    ;

primary
    : T_INT                         { $$ = ms_ast_int(ctx, @$, $1); }
    | T_FLOAT                       { $$ = ms_ast_float(ctx, @$, $1); }
    | T_TRUE                        { $$ = ms_ast_bool(ctx, @$, true); }
    | T_FALSE                       { $$ = ms_ast_bool(ctx, @$, false); }
    | T_NONE                        { $$ = ms_ast_none(ctx, @$); }
    | T_STRING                      { $$ = ms_ast_string(ctx, @$, $1); }
    | T_IDENT                       { $$ = ms_ast_name(ctx, @$, $1); }
    | primary '.' T_IDENT           { $$ = ms_ast_member(ctx, @$, $1, $3); }
    | primary '(' opt_args ')'      { $$ = ms_ast_call(ctx, @$, $1, $3); }
    | '(' expr ')'                  { $$ = $2; }
    | '[' opt_args ']'              { $$ = ms_ast_list(ctx, @$, $2); }
    ;

opt_args
    : %empty                        { $$ = ms_ast_vec(ctx); }
    | args                          { $$ = $1; }
    ;

args
    : arg                           { $$ = ms_ast_vec1(ctx, $1); }
    | args ',' arg                  { $$ = ms_ast_vec_push(ctx, $1, $3); }
    ;

arg
    : expr                          { $$ = ms_ast_arg_new(ctx, @1, NULL, $1); }
    | T_IDENT '=' expr              { $$ = ms_ast_arg_new(ctx, @1, $1, $3); }
    ;

ident
    : T_IDENT                       { $$ = ms_ast_ident_new(ctx, @1, $1); }
    ;

%%

int ms_dsl_yylex(MS_DSL_YYSTYPE *yylval, ms_loc *yylloc, ms_parse_ctx *ctx) {
    int tok = ms_dsl_yylex_impl(yylval, yylloc, ctx->scanner);
    /* remember the last two tokens for syntax error messages */
    ctx->prev_loc = ctx->tok_loc;
    ctx->prev_word = ctx->tok_word;
    ctx->tok_loc = *yylloc;
    if (tok == T_EOF) {
        ctx->tok_word = NULL;
    } else {
        int len = ms_dsl_yyget_leng(ctx->scanner);
        ctx->tok_word = ms_arena_strndup(ctx->arena, ms_dsl_yyget_text(ctx->scanner),
                                         (size_t)(len > 40 ? 40 : len));
    }
    return tok;
}

/* Bison's name of a symbol -> the user's words: keywords and punctuation quoted. */
static void describe(ms_strbuf *b, const char *name, size_t n, const char *word) {
    static const char *const plain[] = {"identifier", "string", "integer", "number", "end of file"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        if (strlen(plain[i]) == n && strncmp(plain[i], name, n) == 0) {
            ms_strbuf_printf(b, "%.*s", (int)n, name);
            if (word != NULL && i < 4)
                ms_strbuf_printf(b, " '%s'", word);
            return;
        }
    }
    if (n >= 2 && name[0] == '\'')
        ms_strbuf_printf(b, "%.*s", (int)n, name);
    else
        ms_strbuf_printf(b, "'%.*s'", (int)n, name);
}

/*
 * Rewrite bison's detailed message "syntax error, unexpected X, expecting A or B" as
 * "syntax error: unexpected 'X', expected 'A' or 'B'", with the text of an unexpected
 * identifier, string or number. Returns false when msg has another shape (kept as is).
 */
static bool rewrite(ms_strbuf *b, const char *msg, const char *word, const char **expect_only) {
    const char *u = strstr(msg, ", unexpected ");
    if (u == NULL)
        return false;
    u += strlen(", unexpected ");
    const char *e = strstr(u, ", expecting ");
    size_t ulen = e != NULL ? (size_t)(e - u) : strlen(u);
    ms_strbuf_puts(b, "syntax error: unexpected ");
    describe(b, u, ulen, word);
    if (e == NULL)
        return true;
    e += strlen(", expecting ");
    ms_strbuf_puts(b, ", expected ");
    *expect_only = strstr(e, " or ") == NULL ? e : NULL;
    while (*e != '\0') {
        const char *o = strstr(e, " or ");
        size_t n = o != NULL ? (size_t)(o - e) : strlen(e);
        describe(b, e, n, NULL);
        if (o == NULL)
            break;
        ms_strbuf_puts(b, " or ");
        e = o + 4;
    }
    return true;
}

/*
 * Syntax errors. Bison's detailed message ("syntax error, unexpected X, expecting Y or Z") is
 * kept, with the offending identifier or string quoted, and at end of file the innermost open
 * bracket is named ("expected '}' to close '{' at line 3").
 */
static void ms_dsl_yyerror(const ms_loc *loc, ms_parse_ctx *ctx, const char *msg) {
    if (strcmp(msg, "memory exhausted") == 0) {
        ms_diags_error(ctx->diags, *loc, "nesting too deep (more than %d open constructs)",
                       YYMAXDEPTH);
        return;
    }
    ms_loc at = *loc;
    if (ctx->at_eof && ctx->prev_word != NULL) {
        /* end of file: point just after the last token, on a line the reader can see */
        at = ctx->prev_loc;
        at.first_line = at.last_line;
        at.first_column = at.last_column = at.last_column + 1;
        loc = &at;
    }
    if (ctx->at_eof && ctx->depth > 0 && ctx->depth <= MS_PARSE_MAX_NESTING) {
        const ms_parse_bracket *b = &ctx->brackets[ctx->depth - 1];
        char close = b->open == '(' ? ')' : b->open == '[' ? ']' : '}';
        ms_diags_error(ctx->diags, *loc, "unexpected end of file: expected '%c' to close '%c' at line %d",
                       close, b->open, b->loc.first_line);
        return;
    }
    ms_strbuf b = {0};
    const char *expect_only = NULL;
    if (!rewrite(&b, msg, ctx->tok_word, &expect_only) || b.oom) {
        ms_strbuf_free(&b);
        ms_diags_error(ctx->diags, *loc, "%s", msg);
        return;
    }
    if (expect_only != NULL && strcmp(expect_only, "';'") == 0 && ctx->prev_word != NULL &&
        ctx->prev_loc.last_line < loc->first_line) {
        /* a missing ';' at the end of a line: point at the end of that line, not the next one */
        ms_loc semi = ctx->prev_loc;
        semi.first_line = semi.last_line;
        semi.first_column = semi.last_column = semi.last_column + 1;
        ms_diags_error(ctx->diags, semi, "syntax error: expected ';' after '%s'", ctx->prev_word);
    } else {
        ms_diags_error(ctx->diags, *loc, "%s", b.data);
    }
    ms_strbuf_free(&b);
}
