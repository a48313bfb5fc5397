#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int c,char**v){size_t g=atoi(v[2]);size_t n=g<<30; int huge=atoi(v[1]);
char*p=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
madvise(p,n,huge?MADV_HUGEPAGE:MADV_NOHUGEPAGE);
for(size_t k=0;k<g;k++){double t=now(); for(size_t i=k<<30;i<(k+1)<<30;i+=4096)p[i]=1; printf("%.0f ",(now()-t)*1e3);} printf("ms per GiB, huge=%d\n",huge);}
