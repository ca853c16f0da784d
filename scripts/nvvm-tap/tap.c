// nvvm-tap: a forwarding libnvvm.so that logs what nvlink asks of libNVVM (see README.md).
// Written for this project; build: gcc -shared -fPIC -O1 -o lib64/libnvvm.so tap.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
static void *real;
static FILE *lg; static int nmod;
static void init(void){ if(real) return; real=dlopen(getenv("REAL_NVVM"),RTLD_NOW|RTLD_LOCAL); lg=fopen(getenv("NVVM_LOG"),"a"); }
#define R(name) init(); void *f=dlsym(real,#name);
typedef intptr_t (*fn6)(intptr_t,intptr_t,intptr_t,intptr_t,intptr_t,intptr_t);
static void *hfn[70000]; static int hop[16]; static int nh;
#define W(i) static intptr_t w##i(intptr_t a,intptr_t b,intptr_t c,intptr_t d,intptr_t e,intptr_t g){ fprintf(lg,"handle(%d)(%lx,%lx,%lx,%lx,%lx,%lx)\n",hop[i],a,b,c,d,e,g); if(hop[i]==8320) dumpmod(b,c,d); fflush(lg); intptr_t r=((fn6)hfn[hop[i]])(a,b,c,d,e,g); fprintf(lg,"  -> %lx\n",r); fflush(lg); return r; }
static void dumpmod(intptr_t b,intptr_t s,intptr_t n){ char p[512]; snprintf(p,512,"%s.mod%d",getenv("NVVM_LOG"),nmod++); FILE*f=fopen(p,"wb"); fwrite((void*)b,1,s,f); fclose(f); fprintf(lg,"  module %s name=%s\n",p,(char*)n); }
W(0) W(1) W(2) W(3) W(4) W(5) W(6) W(7)
static void *wr[8]={w0,w1,w2,w3,w4,w5,w6,w7};

void *__nvvmHandle(int op){ R(__nvvmHandle); void *p=((void*(*)(int))f)(op); fprintf(lg,"__nvvmHandle(%d)=%p\n",op,p); fflush(lg);
  if(!p) return p; for(int i=0;i<nh;i++) if(hop[i]==op) return wr[i]; if(nh<8){hop[nh]=op; hfn[op]=p; return wr[nh++];} return p;}
int nvvmCreateProgram(void *p){ R(nvvmCreateProgram); int r=((int(*)(void*))f)(p); fprintf(lg,"create -> %d prog=%p\n",r,*(void**)p); fflush(lg); return r;}
int nvvmCompileProgram(void *p,int n,const char **o){ R(nvvmCompileProgram); fprintf(lg,"compile %d opts:\n",n); for(int i=0;i<n;i++) fprintf(lg,"  [%s]\n",o[i]); fflush(lg); int r=((int(*)(void*,int,const char**))f)(p,n,o); fprintf(lg,"compile -> %d\n",r); fflush(lg); return r;}
int nvvmAddModuleToProgram(void *p,const char*b,size_t s,const char*n){ R(nvvmAddModuleToProgram); fprintf(lg,"add %zu %s\n",s,n); return ((int(*)(void*,const char*,size_t,const char*))f)(p,b,s,n);}
int nvvmLazyAddModuleToProgram(void *p,const char*b,size_t s,const char*n){ R(nvvmLazyAddModuleToProgram); fprintf(lg,"lazyadd %zu %s\n",s,n); fflush(lg); return ((int(*)(void*,const char*,size_t,const char*))f)(p,b,s,n);}
#define P1(name) int name(void*a){ R(name); fprintf(lg,#name "\n"); fflush(lg); return ((int(*)(void*))f)(a);} 
#define P2(name) int name(void*a,void*b){ R(name); int r=((int(*)(void*,void*))f)(a,b); fprintf(lg,#name " -> %d\n",r); fflush(lg); return r;} 
P1(nvvmDestroyProgram)
P2(nvvmGetCompiledResultSize) P2(nvvmGetCompiledResult) P2(nvvmGetProgramLogSize) P2(nvvmGetProgramLog)
int nvvmVerifyProgram(void *p,int n,const char **o){ R(nvvmVerifyProgram); fprintf(lg,"verify\n"); return ((int(*)(void*,int,const char**))f)(p,n,o);}
const char *nvvmGetErrorString(int r){ R(nvvmGetErrorString); return ((const char*(*)(int))f)(r);}
int nvvmVersion(int*a,int*b){ R(nvvmVersion); fprintf(lg,"version\n"); return ((int(*)(int*,int*))f)(a,b);}
int nvvmIRVersion(int*a,int*b,int*c,int*d){ R(nvvmIRVersion); fprintf(lg,"irversion\n"); return ((int(*)(int*,int*,int*,int*))f)(a,b,c,d);}
int nvvmLLVMVersion(const char*a,int*b){ R(nvvmLLVMVersion); return ((int(*)(const char*,int*))f)(a,b);}
void *__nvvmHandleTarget(int op){ R(__nvvmHandleTarget); fprintf(lg,"handleTarget(%d)\n",op); fflush(lg); return ((void*(*)(int))f)(op);}
int nvvmDisableConcurrentAPI(void){ R(nvvmDisableConcurrentAPI); return ((int(*)(void))f)();}
